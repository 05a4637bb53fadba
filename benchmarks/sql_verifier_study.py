"""How well ``sql_evidence`` tells a wrong text-to-SQL answer from a right one, on real predictions.

Data: Spider dev on 16 databases (``<data>/spider``: ``questions.jsonl`` with 730 questions, the
gold SQL and the SQL of eight published systems; see its ``SOURCE.md``). ``<data>`` is
``--data``, else ``$FIRSTPASS_DATA``, else ``<repo>/../shared/data``; nothing is copied.

For every (question, system) pair the predicted SQL runs read-only on its database (timed:
``elapsed_ms``; at most ``--max-rows`` rows, past that ``truncated``); its result is the
evidence. The answer is a **rendering** of the rows, not model text (no model wrote prose for
these predictions): a one-row result as ``column: value; ...``, otherwise ``The result is: a, b;
c, d.`` (the first ``--show-rows`` rows, then ``(N rows in all)``), numbers written plainly. A
prediction that fails to run gets evidence without rows and the answer ``The query failed.``
``sql_evidence`` then runs on (question, answer, evidence) and never sees the gold SQL.

Labels: execution match against the gold SQL: the result rows as multisets, allowing a
reordering of columns (every permutation for up to 6 columns, else rows compared as sorted
tuples). A prediction that fails is wrong.

Reported: per check and overall (``hard`` = a part of severity ``error`` failed; ``any`` = any
part failed, warnings included), how often it fires, precision and recall of firing against
"wrong", and the lift (fire rate among wrong / among right); per system; a cascade gated by the
verifier (serve the cheap system's SQL unless the gate fires, else the strong system's);
number-injection recall of ``numbers_in_evidence`` and its false alarms on the untouched
answers under other number styles; and the cost of ``run_blocking`` per answer with reruns off
(``rerun_ms`` 0.001) and on (the default 500 ms). Prints numbers only; never asserts times.

A fixed split of the 16 databases (``SPLIT``, chosen before anyone looked, by the parity of
the first hex digit of sha256(db_id)): checks are tuned on ``tune`` and measured on ``report``;
``--split all`` (the default) prints both halves side by side: hard-gate precision and recall,
recall on wrong predictions that run, the cascade's headroom captured, and per check its fire
rate, precision and lift.

    python -m benchmarks.sql_verifier_study [--split tune|report|all] [--data DIR] [--limit N]
        [--inject-share 0.3] [--seed 0] [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import random
import re
import sqlite3
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._report import command_line, machine, percentile, revision
from benchmarks.datasets import data_dir
from firstpass.checks import CheckRequest, Options
from firstpass.checks._sql import RULES, SqlEvidenceCheck, holds, stated_numbers
from firstpass.checks._sql._numbers import evidence_numbers

__all__ = ["main", "matches", "render"]

SYSTEMS = (
    "dail-sql-gpt4",
    "dail-sql-gpt4-sc",
    "graphix-t5",
    "din-sql-gpt4",
    "gpt4-few-shot",
    "gpt4-zero-shot",
    "din-sql-codex",
    "codex-few-shot",
)
CASCADES = (("codex-few-shot", "dail-sql-gpt4"), ("gpt4-zero-shot", "din-sql-gpt4"))
CHECK_NAMES = tuple(name for name, _ in RULES)
SEVERITY = dict(RULES)
STYLES = ("round2", "thousands", "percent")
#: the fixed split: tune on the first half, report on the second (272 and 458 questions)
SPLIT: dict[str, frozenset[str]] = {
    "tune": frozenset(
        {
            "battle_death", "concert_singer", "cre_Doc_Template_Mgt", "employee_hire_evaluation",
            "poker_player", "real_estate_properties", "singer", "voter_1",
        }
    ),
    "report": frozenset(
        {
            "car_1", "course_teach", "flight_2", "museum_visit", "network_1", "pets_1",
            "student_transcripts_tracking", "tvshow",
        }
    ),
}  # fmt: skip


# -- running SQL ------------------------------------------------------------------------------


@dataclass
class Run:
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] | None = None
    elapsed_ms: float = 0.0
    truncated: bool = False
    error: str | None = None


def _cell(v: object) -> object:
    return v.hex() if isinstance(v, bytes) else v  # evidence cells are JSON scalars


def execute(path: Path, sql: str, *, max_rows: int, budget_s: float) -> Run:
    """``sql`` on the database read-only, timed from execute to the last row fetched."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        conn.execute("PRAGMA query_only = ON")
        deadline = time.monotonic() + budget_s
        conn.set_progress_handler(lambda: 1 if time.monotonic() >= deadline else 0, 10_000)
        t0 = time.perf_counter()
        try:
            cur = conn.execute(sql)
            got = cur.fetchmany(max_rows + 1)
        except (sqlite3.Error, ValueError, OverflowError) as exc:
            return Run(error=f"{type(exc).__name__}: {exc}"[:200])
        elapsed = (time.perf_counter() - t0) * 1000.0
        columns = [d[0] for d in cur.description or ()]
        return Run(
            columns=columns,
            rows=[[_cell(c) for c in r] for r in got[:max_rows]],
            elapsed_ms=elapsed,
            truncated=len(got) > max_rows,
        )
    finally:
        conn.close()


def _norm(v: object) -> object:
    if isinstance(v, float) and math.isfinite(v):
        return float(f"{v:.9g}")
    return v


def _key(v: object) -> tuple[str, str]:
    return (type(v).__name__ if not isinstance(v, int | float) else "num", repr(v))


def matches(gold: Run, pred: Run) -> bool:
    """Rows equal as multisets, allowing a reordering of the predicted columns."""
    if gold.rows is None or pred.rows is None:
        return False
    g = Counter(tuple(_norm(c) for c in r) for r in gold.rows)
    p_rows = [tuple(_norm(c) for c in r) for r in pred.rows]
    if Counter(p_rows) == g:
        return True
    width = len(gold.columns)
    if width != len(pred.columns) or width < 2:
        return False
    if width <= 6:
        return any(
            Counter(tuple(r[i] for i in perm) for r in p_rows) == g
            for perm in itertools.permutations(range(width))
        )
    return Counter(tuple(sorted(r, key=_key)) for r in p_rows) == Counter(
        tuple(sorted(r, key=_key)) for r in g
    )


# -- rendering --------------------------------------------------------------------------------


def plain(v: object, style: str = "plain") -> str:
    """One cell as a person would write it; ``style`` varies how numbers look."""
    if v is None:
        return "NULL"
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if style == "round2" and isinstance(v, float):
        return f"{v:.2f}"
    if style == "thousands" and abs(v) >= 1000:
        return f"{v:,}" if isinstance(v, int) else f"{v:,.2f}"
    if style == "percent":
        if isinstance(v, float) and 0 < abs(v) <= 1:
            return f"{v * 100:.1f}%"
        return plain(v) + "%"
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        s = repr(v)
        return f"{v:.12f}".rstrip("0") if "e" in s else s
    return str(v)


def render(run: Run, *, show_rows: int = 20, style: str = "plain") -> str:
    """The answer the study checks: the rows written out (a rendering, not model text)."""
    if run.rows is None:
        return "The query failed."
    if not run.rows:
        return "The query returned no rows."
    if len(run.rows) == 1:
        cells = [f"{c}: {plain(v, style)}" for c, v in zip(run.columns, run.rows[0], strict=False)]
        return "; ".join(cells) + "."
    shown = "; ".join(", ".join(plain(v, style) for v in r) for r in run.rows[:show_rows])
    more = f" ({len(run.rows)} rows in all)" if len(run.rows) > show_rows else ""
    return f"The result is: {shown}.{more}"


def changed(style: str, run: Run) -> bool:
    """Whether ``style`` writes some number of this result differently from ``plain``."""
    return run.rows is not None and any(
        plain(v, style) != plain(v)
        for r in run.rows[:20]
        for v in r
        if isinstance(v, int | float) and not isinstance(v, bool)
    )


def inject(answer: str, rng: random.Random) -> str | None:
    """The answer with one stated number made wrong: +1 for an integer, x1.1 for a decimal
    (shown with the same decimals; +1 in the last digit when that rounds back)."""
    nums = stated_numbers(answer)
    if not nums:
        return None
    n = rng.choice(nums)
    if n.decimals == 0:
        new = f"{int(n.value) + 1}"
    else:
        wrong = n.value * 1.1 if n.value else 1.0
        new = f"{wrong:.{n.decimals}f}"
        if float(new) == n.value:
            new = f"{n.value + 10.0**-n.decimals:.{n.decimals}f}"
    if n.percent:
        new += "%"
    return answer[: n.start] + answer[n.start :].replace(n.text, new, 1)


# -- the study ----------------------------------------------------------------------------------


def _evidence(sql: str, run: Run) -> dict[str, Any]:
    if run.rows is None:
        return {"sql": sql}
    return {
        "sql": sql,
        "columns": run.columns,
        "rows": run.rows,
        "elapsed_ms": run.elapsed_ms,
        "truncated": run.truncated,
    }


def _flags(result: Any) -> dict[str, Any]:
    by = {p.name: p for p in result.parts}
    if not by:  # the whole check failed before its rules (no evidence)
        return {"fired": [], "skipped": [], "errors": [], "hard": not result.passed, "any": True}
    fired = [n for n in CHECK_NAMES if n in by and not by[n].passed]
    return {
        "fired": fired,
        "skipped": [n for n in CHECK_NAMES if n in by and by[n].details.get("skipped")],
        "errors": [n for n in CHECK_NAMES if n in by and by[n].category == "check_error"],
        "hard": any(SEVERITY[n] == "error" for n in fired),
        "any": bool(fired),
        "reasons": {n: list(by[n].reasons)[:5] for n in fired},
    }


def _rates(fire: list[bool], wrong: list[bool]) -> dict[str, Any]:
    n = len(fire)
    tp = sum(f and w for f, w in zip(fire, wrong, strict=True))
    nf, nw = sum(fire), sum(wrong)
    fire_right = sum(f and not w for f, w in zip(fire, wrong, strict=True))
    rate_w = tp / nw if nw else math.nan
    rate_r = fire_right / (n - nw) if n - nw else math.nan
    return {
        "n": n,
        "fires": nf,
        "fire_rate": nf / n if n else math.nan,
        "precision": tp / nf if nf else math.nan,
        "recall": rate_w,
        "fire_rate_right": rate_r,
        "lift": rate_w / rate_r if rate_r else (math.inf if tp else math.nan),
    }


def study(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    questions = [
        json.loads(line)
        for line in (root / "questions.jsonl").read_text().splitlines()
        if line.strip()
    ]
    if args.split != "all":
        questions = [q for q in questions if q["db_id"] in SPLIT[args.split]]
    if args.limit:
        questions = questions[: args.limit]
    checkers: dict[str, tuple[SqlEvidenceCheck, SqlEvidenceCheck]] = {}
    pairs: list[dict[str, Any]] = []
    t_exec = 0.0
    started = time.perf_counter()
    for qi, q in enumerate(questions):
        db = root / "database" / q["db_id"] / f"{q['db_id']}.sqlite"
        if q["db_id"] not in checkers:
            checkers[q["db_id"]] = (
                SqlEvidenceCheck(options=Options(name="sql"), database=db),  # reruns on (500 ms)
                SqlEvidenceCheck(options=Options(name="sql"), database=db, rerun_ms=0.001),
            )
        with_rerun, no_rerun = checkers[q["db_id"]]
        gold = execute(db, q["gold_sql"], max_rows=args.max_rows, budget_s=args.budget_s)
        for si, system in enumerate(SYSTEMS):
            sql = q["predictions"].get(system)
            if not isinstance(sql, str) or not sql.strip():
                sql = "SELECT"  # no prediction: fails like any broken SQL
            t0 = time.perf_counter()
            run = execute(db, sql, max_rows=args.max_rows, budget_s=args.budget_s)
            t_exec += time.perf_counter() - t0
            answer = render(run, show_rows=args.show_rows)
            request = CheckRequest(prompt=q["question"], evidence=(_evidence(sql, run),))
            timed: dict[str, float] = {}
            results: dict[str, Any] = {}
            order = (("on", with_rerun), ("off", no_rerun))
            for mode, checker in order if (qi + si) % 2 else order[::-1]:  # alternate: drift
                t0 = time.perf_counter()
                results[mode] = checker.run_blocking(answer, request)
                timed[mode] = (time.perf_counter() - t0) * 1000.0
            flags = _flags(results["on"])
            flags_off = _flags(results["off"])
            pairs.append(
                {
                    "idx": q["idx"],
                    "db": q["db_id"],
                    "system": system,
                    "ok": matches(gold, run),
                    "failed": run.rows is None,
                    "gold_failed": gold.rows is None,
                    "n_rows": None if run.rows is None else len(run.rows),
                    "truncated": run.truncated,
                    "exec_ms": run.elapsed_ms,
                    "ms_on": timed["on"],
                    "ms_off": timed["off"],
                    "answer": answer,
                    "question": q["question"],
                    "sql": sql,
                    "run": run,
                    **flags,
                    "hard_off": flags_off["hard"],
                    "any_off": flags_off["any"],
                }
            )
        if args.progress and (qi + 1) % 100 == 0:
            print(
                f"  {qi + 1}/{len(questions)} questions, {time.perf_counter() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    out: dict[str, Any] = {"n_questions": len(questions), "n_pairs": len(pairs)}
    out["exec_s"] = t_exec
    out["gold_failed"] = len({p["idx"] for p in pairs if p["gold_failed"]})
    out.update(summarise(pairs))
    out["cascades"] = cascades(pairs)
    out["numbers"] = number_study(pairs, checkers, args)
    out["cost"] = {
        mode: {
            "p50_ms": percentile([p[f"ms_{mode}"] for p in pairs], 50),
            "p90_ms": percentile([p[f"ms_{mode}"] for p in pairs], 90),
            "p99_ms": percentile([p[f"ms_{mode}"] for p in pairs], 99),
            "mean_ms": sum(p[f"ms_{mode}"] for p in pairs) / max(1, len(pairs)),
        }
        for mode in ("off", "on")
    }
    out["cost"]["exec_p50_ms"] = percentile([p["exec_ms"] for p in pairs if not p["failed"]], 50)
    out["reruns_change_verdict"] = sum(p["hard"] != p["hard_off"] for p in pairs)
    out["examples"] = examples(pairs)
    out["diagnostics"] = diagnostics(pairs)
    out["split"] = args.split
    out["halves"] = halves(pairs)
    return out


def halves(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """The held-out-style metrics on each half of the split that this run covers."""
    out: dict[str, Any] = {}
    for name, dbs in SPLIT.items():
        sub = [p for p in pairs if p["db"] in dbs]
        if not sub:
            continue
        summary = summarise(sub)
        ran = [p for p in sub if not p["failed"]]
        cascade = cascades(sub).get("codex-few-shot -> dail-sql-gpt4", {})
        out[name] = {
            "pairs": len(sub),
            "questions": len({p["idx"] for p in sub}),
            "wrong": summary["wrong"],
            "wrong_that_run": sum(not p["ok"] for p in ran),
            "hard": summary["overall"]["hard"],
            "hard_on_run": _rates([p["hard"] for p in ran], [not p["ok"] for p in ran]),
            "any_on_run": _rates([p["any"] for p in ran], [not p["ok"] for p in ran]),
            "headroom_captured": cascade.get("hard", {}).get("headroom_captured", math.nan),
            "headroom_captured_any": cascade.get("any", {}).get("headroom_captured", math.nan),
            "checks": summary["checks"],
        }
    return out


def summarise(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    wrong = [not p["ok"] for p in pairs]
    checks: dict[str, Any] = {}
    for name in CHECK_NAMES:
        row = _rates([name in p["fired"] for p in pairs], wrong)
        row["severity"] = SEVERITY[name]
        row["skipped_rate"] = sum(name in p["skipped"] for p in pairs) / max(1, len(pairs))
        row["check_errors"] = sum(name in p["errors"] for p in pairs)
        checks[name] = row
    overall = {
        "hard": _rates([p["hard"] for p in pairs], wrong),
        "any": _rates([p["any"] for p in pairs], wrong),
        # the rendering is faithful, so check 3 firing here is a false alarm by construction
        "hard, numbers_in_evidence left out": _rates(
            [
                any(SEVERITY[n] == "error" for n in p["fired"] if n != "numbers_in_evidence")
                for p in pairs
            ],
            wrong,
        ),
        "hard, failed-to-run excluded": _rates(
            [p["hard"] for p in pairs if not p["failed"]],
            [not p["ok"] for p in pairs if not p["failed"]],
        ),
    }
    systems: dict[str, Any] = {}
    for system in SYSTEMS:
        sub = [p for p in pairs if p["system"] == system]
        if not sub:
            continue
        w = [not p["ok"] for p in sub]
        systems[system] = {
            "accuracy": sum(p["ok"] for p in sub) / len(sub),
            "failed_to_run": sum(p["failed"] for p in sub),
            "hard": _rates([p["hard"] for p in sub], w),
            "any": _rates([p["any"] for p in sub], w),
            "fires": {n: sum(n in p["fired"] for p in sub) for n in CHECK_NAMES},
        }
    return {
        "accuracy": sum(p["ok"] for p in pairs) / max(1, len(pairs)),
        "wrong": sum(wrong),
        "failed_to_run": sum(p["failed"] for p in pairs),
        "checks": checks,
        "overall": overall,
        "systems": systems,
    }


def cascades(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    by = {(p["idx"], p["system"]): p for p in pairs}
    out: dict[str, Any] = {}
    for cheap, strong in CASCADES:
        idxs = sorted({i for i, s in by if s == cheap and (i, strong) in by})
        if not idxs:
            continue
        n = len(idxs)
        c_ok = [by[i, cheap]["ok"] for i in idxs]
        s_ok = [by[i, strong]["ok"] for i in idxs]
        acc_cheap, acc_strong = sum(c_ok) / n, sum(s_ok) / n
        acc_perfect = sum(c or s for c, s in zip(c_ok, s_ok, strict=True)) / n
        row: dict[str, Any] = {
            "n": n,
            "always_cheap": acc_cheap,
            "always_strong": acc_strong,
            "perfect": acc_perfect,
            "perfect_escalation": 1 - acc_cheap,
        }
        for gate in ("hard", "any", "hard or failed"):
            if gate == "hard or failed":  # what a harness adds: escalate a query that errors
                esc = [by[i, cheap]["hard"] or by[i, cheap]["failed"] for i in idxs]
            else:
                esc = [by[i, cheap][gate] for i in idxs]
            acc = sum(s if e else c for e, c, s in zip(esc, c_ok, s_ok, strict=True)) / n
            rate = sum(esc) / n
            head = acc_perfect - acc_cheap
            # a gate that escalates the same share at random (expected accuracy)
            rand = acc_cheap + rate * (acc_strong - acc_cheap)
            row[gate] = {
                "accuracy": acc,
                "escalation": rate,
                "headroom_captured": (acc - acc_cheap) / head if head else math.nan,
                "random_gate_accuracy": rand,
                "escalated_cheap_wrong": sum(e and not c for e, c in zip(esc, c_ok, strict=True)),
                "escalated_cheap_right": sum(e and c for e, c in zip(esc, c_ok, strict=True)),
            }
        out[f"{cheap} -> {strong}"] = row
    return out


def number_study(
    pairs: list[dict[str, Any]],
    checkers: dict[str, tuple[SqlEvidenceCheck, SqlEvidenceCheck]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Check 3 on injected wrong numbers, and its false alarms on untouched answers by style."""
    rng = random.Random(args.seed)
    eligible = [
        p for p in pairs if p["run"].rows and stated_numbers(p["answer"])
    ]  # answers that state a number
    chosen = set(rng.sample(range(len(eligible)), round(args.inject_share * len(eligible))))

    def fires(p: dict[str, Any], answer: str) -> bool:
        request = CheckRequest(prompt=p["question"], evidence=(_evidence(p["sql"], p["run"]),))
        result = checkers[p["db"]][1].run_blocking(answer, request)
        return any(part.name == "numbers_in_evidence" and not part.passed for part in result.parts)

    caught = injected = 0
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    missed: list[dict[str, str]] = []
    for i, p in enumerate(eligible):
        if i not in chosen:
            continue
        bad = inject(p["answer"], rng)
        if bad is None or bad == p["answer"]:
            continue
        injected += 1
        # the wrong number, and whether the evidence holds it anyway (another cell, a count)
        new = next(
            n
            for a, n in itertools.zip_longest(stated_numbers(p["answer"]), stated_numbers(bad))
            if a is None or n is None or a.text != n.text
        )
        values = _values(p)
        kind = ("decimal" if new.decimals else "integer") + (
            ", held elsewhere" if holds(new, values) else ""
        )
        by_kind[kind]["injected"] += 1
        if fires(p, bad):
            caught += 1
            by_kind[kind]["caught"] += 1
        elif len(missed) < 5:
            missed.append({"answer": p["answer"][:200], "injected": bad[:200]})
    untouched = [p for i, p in enumerate(eligible) if i not in chosen]
    with_rows = [p for p in pairs if p["run"].rows is not None]
    plain_fa = [p for p in with_rows if "numbers_in_evidence" in p["fired"]]
    styles: dict[str, Any] = {}
    for style in STYLES:
        affected = [p for p in untouched if changed(style, p["run"])]
        alarms = [
            p for p in affected if fires(p, render(p["run"], show_rows=args.show_rows, style=style))
        ]
        plain_alarms = sum("numbers_in_evidence" in p["fired"] for p in affected)
        styles[style] = {
            "affected": len(affected),
            "false_alarms": len(alarms),
            "false_alarms_plain_rendering": plain_alarms,
            "examples": [render(p["run"], show_rows=3, style=style)[:160] for p in alarms[:3]],
        }
    return {
        "eligible": len(eligible),
        "injected": injected,
        "caught": caught,
        "recall": caught / injected if injected else math.nan,
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "missed_examples": missed,
        "plain_false_alarm_causes": dict(Counter(_cause(p) for p in plain_fa)),
        "untouched": len(untouched),
        "untouched_false_alarms": sum("numbers_in_evidence" in p["fired"] for p in untouched),
        "plain_with_rows": len(with_rows),
        "plain_false_alarms_all": len(plain_fa),
        "plain_false_alarm_examples": [
            {"answer": p["answer"][:160], "reasons": p["reasons"].get("numbers_in_evidence")}
            for p in plain_fa[:5]
        ],
        "styles": styles,
    }


def _values(p: dict[str, Any]) -> list[float]:
    """What check 3 accepts for this pair: result cells, the row count, the question's numbers."""
    rows = p["run"].rows or []
    values = evidence_numbers(c for r in rows for c in r)
    return [*values, float(len(rows)), *(n.value for n in stated_numbers(p["question"]))]


def _cause(p: dict[str, Any]) -> str:
    """Why check 3 fired on a faithful rendering: where the unheld numbers come from."""
    values = _values(p)
    texts = [c for r in p["run"].rows or [] for c in r if isinstance(c, str)]
    causes = set()
    for n in stated_numbers(p["answer"]):
        if holds(n, values):
            continue
        if any(n.text in t for t in texts):
            causes.add("digits inside a text cell")
        elif any(n.text in c for c in p["run"].columns):
            causes.add("digits in a column name")
        else:
            causes.add("other")
    return " + ".join(sorted(causes)) or "none"


def diagnostics(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts behind the weak spots the report names."""
    qcu = [p for p in pairs if "question_columns_used" in p["fired"]]

    def own_key(reason: str) -> bool:
        m = re.search(r"names '(\w+)' \((\w+)\.(\w+)\)", reason)
        return m is not None and m.group(3).lower() in (f"{m.group(1)}_id", f"{m.group(1)}id")

    return {
        "failed_to_run": sum(p["failed"] for p in pairs),
        "failed_to_run_passing_hard": sum(p["failed"] and not p["hard"] for p in pairs),
        "tables_exist_on_executed": sum(
            "tables_exist" in p["fired"] and not p["failed"] for p in pairs
        ),
        "no_sum_over_text_on_right": sum(
            "no_sum_over_text" in p["fired"] and p["ok"] for p in pairs
        ),
        "question_columns_used_fires": len(qcu),
        "question_columns_used_only_own_key": sum(
            all(own_key(r) for r in p["reasons"]["question_columns_used"]) for p in qcu
        ),
        "question_columns_used_only_own_key_on_right": sum(
            p["ok"] and all(own_key(r) for r in p["reasons"]["question_columns_used"]) for p in qcu
        ),
        # the aggregate word is part of a column's name the SQL reads (Number_products, Average)
        "aggregate_word_in_a_column_name": sum(
            "aggregate_matches_question" in p["fired"]
            and all(
                any(
                    len(w) >= 4 and re.search(rf"(?<![a-z]){w}(?![a-z])", p["sql"], re.I)
                    for w in said.split()
                )
                for r in p["reasons"]["aggregate_matches_question"]
                for said in re.findall(r"says '([a-z ]+)'", r)
            )
            for p in pairs
        ),
        "aggregate_matches_question_fires": sum(
            "aggregate_matches_question" in p["fired"] for p in pairs
        ),
    }


def examples(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """A few fired pairs per check (right and wrong), to read what the checks catch."""
    out: dict[str, Any] = {}
    for name in CHECK_NAMES:
        hits = [p for p in pairs if name in p["fired"]]
        out[name] = [
            {
                "system": p["system"],
                "idx": p["idx"],
                "ok": p["ok"],
                "question": p["question"][:120],
                "sql": p["sql"].strip()[:160],
                "reason": (p["reasons"].get(name) or [""])[0][:200],
            }
            for p in ([h for h in hits if not h["ok"]][:3] + [h for h in hits if h["ok"]][:3])
        ]
    return out


# -- printing -----------------------------------------------------------------------------------


def _f(x: float, digits: int = 1) -> str:
    if x != x:
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{100 * x:.{digits}f}%"


def _x(x: float) -> str:
    return "-" if x != x else ("inf" if math.isinf(x) else f"{x:.2f}x")


def report(doc: dict[str, Any]) -> str:
    lines = [
        f"pairs {doc['n_pairs']} ({doc['n_questions']} questions x {len(doc['systems'])} "
        f"systems); execution accuracy {_f(doc['accuracy'])}; wrong {doc['wrong']} "
        f"(of which failed to run {doc['failed_to_run']}); gold failed on {doc['gold_failed']}",
        "",
        "| check | severity | fires | fire rate | skipped | precision (wrong|fires) | recall "
        "(fires|wrong) | fire rate right | lift | rule crashed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in doc["checks"].items():
        lines.append(
            f"| {name} | {r['severity']} | {r['fires']} | {_f(r['fire_rate'])} | "
            f"{_f(r['skipped_rate'])} | {_f(r['precision'])} | {_f(r['recall'])} | "
            f"{_f(r['fire_rate_right'])} | {_x(r['lift'])} | {r['check_errors']} |"
        )
    for name, r in doc["overall"].items():
        lines.append(
            f"| **{name}** | | {r['fires']} | {_f(r['fire_rate'])} | | {_f(r['precision'])} | "
            f"{_f(r['recall'])} | {_f(r['fire_rate_right'])} | {_x(r['lift'])} | |"
        )
    lines += [
        "",
        "| system | accuracy | failed to run | hard: fires | precision | recall | lift | "
        "any: fires | precision | recall | lift |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for system, r in doc["systems"].items():
        h, a = r["hard"], r["any"]
        lines.append(
            f"| {system} | {_f(r['accuracy'])} | {r['failed_to_run']} | {_f(h['fire_rate'])} | "
            f"{_f(h['precision'])} | {_f(h['recall'])} | {_x(h['lift'])} | "
            f"{_f(a['fire_rate'])} | {_f(a['precision'])} | {_f(a['recall'])} | "
            f"{_x(a['lift'])} |"
        )
    lines += [
        "",
        "| cascade | gate | accuracy | escalation | headroom captured | random gate, same rate "
        "| always cheap | always strong | perfect (escalation) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in doc["cascades"].items():
        for gate in ("hard", "any", "hard or failed"):
            g = r[gate]
            lines.append(
                f"| {name} | {gate} | {_f(g['accuracy'])} | {_f(g['escalation'])} | "
                f"{_f(g['headroom_captured'])} | {_f(g['random_gate_accuracy'])} | "
                f"{_f(r['always_cheap'])} | {_f(r['always_strong'])} | "
                f"{_f(r['perfect'])} ({_f(r['perfect_escalation'])}) |"
            )
    n = doc["numbers"]
    lines += [
        "",
        f"numbers_in_evidence: injected {n['injected']} of {n['eligible']} answers stating a "
        f"number; caught {n['caught']} (recall {_f(n['recall'])}); false alarms on untouched "
        f"{n['untouched_false_alarms']}/{n['untouched']}; on every plain rendering with rows "
        f"{n['plain_false_alarms_all']}/{n['plain_with_rows']}",
    ]
    lines.append(f"  by injected number: {n['by_kind']}")
    lines.append(f"  causes of false alarms on plain renderings: {n['plain_false_alarm_causes']}")
    for style, s in n["styles"].items():
        lines.append(
            f"  style {style}: {s['affected']} untouched answers written differently, false "
            f"alarms {s['false_alarms']} (plain rendering of the same: "
            f"{s['false_alarms_plain_rendering']})"
        )
    c = doc["cost"]
    lines += [
        "",
        f"run_blocking per answer: reruns off p50 {c['off']['p50_ms']:.2f} ms, p90 "
        f"{c['off']['p90_ms']:.2f} ms, p99 {c['off']['p99_ms']:.2f} ms; reruns on (500 ms) p50 "
        f"{c['on']['p50_ms']:.2f} ms, p90 {c['on']['p90_ms']:.2f} ms, p99 "
        f"{c['on']['p99_ms']:.2f} ms; the prediction's own execution p50 "
        f"{c['exec_p50_ms']:.2f} ms; reruns changed the hard verdict on "
        f"{doc['reruns_change_verdict']} pairs",
    ]
    lines += ["", f"diagnostics: {doc['diagnostics']}"]
    lines += ["", *halves_report(doc["halves"])]
    return "\n".join(lines)


def halves_report(h: dict[str, Any]) -> list[str]:
    """The two halves of the split side by side (a half this run did not cover is left out)."""
    names = list(h)
    if not names:
        return []
    head = " | ".join(f"{n} ({h[n]['questions']} q, {h[n]['pairs']} pairs)" for n in names)
    lines = [
        f"split halves: | metric | {head} |",
        "|---|" + "---|" * len(names),
    ]
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("wrong (of which run)", lambda r: f"{r['wrong']} ({r['wrong_that_run']})"),
        ("hard-gate precision", lambda r: _f(r["hard"]["precision"])),
        ("hard-gate recall of wrong", lambda r: _f(r["hard"]["recall"])),
        ("hard-gate recall of wrong that run", lambda r: _f(r["hard_on_run"]["recall"])),
        ("hard-gate precision on queries that run", lambda r: _f(r["hard_on_run"]["precision"])),
        ("any-part recall of wrong that run", lambda r: _f(r["any_on_run"]["recall"])),
        ("cascade codex-few-shot -> dail-sql-gpt4, headroom captured (hard)",
         lambda r: _f(r["headroom_captured"])),
        ("the same, gate = any part", lambda r: _f(r["headroom_captured_any"])),
    ]  # fmt: skip
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(h[n]) for n in names) + " |")
    lines += [
        "",
        "| check | severity | " + " | ".join(f"{n}: fires, precision, lift" for n in names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for check in CHECK_NAMES:
        cells = []
        for n in names:
            r = h[n]["checks"][check]
            cells.append(f"{r['fires']}, {_f(r['precision'])}, {_x(r['lift'])}")
        lines.append(f"| {check} | {SEVERITY[check]} | " + " | ".join(cells) + " |")
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--data",
        help="shared data directory (default $FIRSTPASS_DATA, else "
        "<repo>/../shared/data); reads <data>/spider",
    )
    p.add_argument(
        "--split",
        choices=("tune", "report", "all"),
        default="all",
        help="only the databases of one half of SPLIT (default: both, reported side by side)",
    )
    p.add_argument("--limit", type=int, default=None, help="only the first N questions")
    p.add_argument("--max-rows", type=int, default=10_000, help="rows kept per result")
    p.add_argument("--budget-s", type=float, default=10.0, help="time allowed per query")
    p.add_argument("--show-rows", type=int, default=20, help="rows written into an answer")
    p.add_argument("--inject-share", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--progress", action="store_true", help="progress on stderr")
    p.add_argument("--json", help="write the results as JSON here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    data = Path(args.data) if args.data else data_dir()
    root = data / "spider"
    if not (root / "questions.jsonl").exists():
        print(
            f"skipped: {root / 'questions.jsonl'} not found: set FIRSTPASS_DATA or --data to "
            "the shared data directory (it holds spider/)",
            file=sys.stderr,
        )
        return 2
    started = time.perf_counter()
    doc = study(args, root)
    doc["wall_s"] = time.perf_counter() - started
    doc["command"] = command_line("benchmarks.sql_verifier_study", argv)
    doc["machine"] = machine()
    doc["code"] = revision()
    # the check's own source can change under an uncommitted tree: name the exact version
    sql_dir = Path(__file__).resolve().parent.parent / "firstpass" / "checks" / "_sql"
    doc["sql_code_sha256"] = hashlib.sha256(
        b"".join(f.read_bytes() for f in sorted(sql_dir.glob("*.py")))
    ).hexdigest()[:12]
    print(report(doc))
    print(
        f"\nwall {doc['wall_s']:.0f} s; {doc['machine']}; code {doc['code']}; "
        f"firstpass/checks/_sql sha256 {doc['sql_code_sha256']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
