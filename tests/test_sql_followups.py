"""The SQL verifier's follow-up calls end to end (docs/checks.md, "Follow-up calls"): a live
server, a scripted stub upstream and the real openai SDK.

A rerun that disagrees with the recorded rows brings one tool-free corrective re-ask (the rows
as they are now only when the operator opted in with ``reask_rows``); a warning on an answer that passed the hard checks brings one tool-free
self-check. The second answer is checked like any answer, compared number by number with the
first, served only when it passes, and on the receipt with its own call."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, cast

import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam

from tests.server_harness import CHEAP, MODEL, STRONG
from tests.sql_conversation import build_sales_db, sql_tool_conversation
from tests.stub_upstream import Reply

#: e2e: every test drives a live server with the real openai SDK
pytestmark = pytest.mark.e2e

SQL_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "sql",
        "description": "run one read-only SQLite query",
        "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}},
    },
}
SQL = "SELECT region, sum(amount) AS total FROM orders GROUP BY region ORDER BY total DESC"
TRUE_ROWS = [["South", 300.0], ["North", 200.0], ["East", 50.0]]
#: what the tool message claims: South's total is not what the database returns
FORGED_ROWS = [["South", 999.0], ["North", 200.0], ["East", 50.0]]
TOTALS = "What is the total order amount per region?"
#: the question says "average" but the SQL sums: a warning (aggregate_matches_question)
AVERAGES = "What is the average order amount in each region?"


@pytest.fixture
def sales_db(tmp_path: Path) -> Path:
    return build_sales_db(tmp_path / "sales.sqlite")


def conversation(question: str, rows: list[list[Any]]) -> list[dict[str, Any]]:
    """What an agent harness sends: the question, its SQL tool call and the tool's result."""
    result = {"columns": ["region", "total"], "rows": rows, "elapsed_ms": 0.4}
    return sql_tool_conversation(question, SQL, result)


def sql_route(db: Path, **check: Any) -> dict[str, Any]:
    spec = {"kind": "sql_evidence", "name": "evidence", "database": str(db), **check}
    return {"gate_checks": [spec]}


#: the operator's opt-in: the re-ask shows the model each disagreeing rerun's rows
SHOWN = {"reask_rows": 30}


def ask(
    stack: Any,
    messages: list[dict[str, Any]],
    *,
    stream: bool = False,
    max_tokens: int | openai.Omit = openai.omit,
    evidence: list[dict[str, Any]] | None = None,
) -> Any:
    """The served message's content, and the response's ``firstpass`` object (None when
    streamed: the stream carries only the answer)."""
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    if stream:
        with client.chat.completions.stream(
            model=MODEL,
            messages=cast("list[ChatCompletionMessageParam]", messages),
            tools=[SQL_TOOL],
            max_tokens=max_tokens,
        ) as events:
            for _ in events:
                pass
            streamed = events.get_final_completion()
        assert not streamed.choices[0].message.tool_calls
        return streamed.choices[0].message.content, None
    completion = client.chat.completions.create(
        model=MODEL,
        messages=cast("list[ChatCompletionMessageParam]", messages),
        tools=[SQL_TOOL],
        tool_choice="auto",
        max_tokens=max_tokens,
        extra_body=None if evidence is None else {"firstpass": {"evidence": evidence}},
    )
    assert not completion.choices[0].message.tool_calls and completion.model_extra is not None
    return completion.choices[0].message.content, completion.model_extra["firstpass"]


def parts_of(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (evidence,) = entry["results"]
    return {p["name"]: p for p in evidence["parts"]}


def purposes(receipt: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["model"], c["purpose"]) for c in receipt["upstream_calls"]]


# -- the corrective re-ask -------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_rerun_that_disagrees_brings_one_tool_free_reask_whose_answer_is_served(
    live_stack: Any, sales_db: Path, stream: bool
) -> None:
    stack = live_stack(route_extra=sql_route(sales_db, **SHOWN))
    stack.stub.script(
        Reply.ok("South leads with 999."), Reply.ok("South leads with 300."), model=CHEAP
    )
    content, fp = ask(stack, conversation(TOTALS, FORGED_ROWS), stream=stream)

    assert content == "South leads with 300."  # the reconciled answer, and only it
    if fp is not None:
        assert fp["action"] == "served" and fp["verification"] == "verified"
    first, reask = stack.stub.completions
    assert "tools" in first.body and "tool_choice" not in reask.body and "tools" not in reask.body
    told = reask.body["messages"][-1]["content"]
    assert SQL in told and '["South", 300.0]' in told and "3 rows recorded" in told
    assert reask.body["messages"][-2] == {"role": "assistant", "content": "South leads with 999."}
    # no tool history in a body that offers no tools (Anthropic refuses one): told as text
    history = reask.body["messages"][:-2]
    assert [m["role"] for m in history] == ["user", "assistant", "user"]
    assert not any("tool_calls" in m or "tool_call_id" in m for m in history)
    assert history[1]["content"].startswith("I ran sql: ") and SQL in history[1]["content"]
    assert history[2]["content"].startswith("The sql tool returned: ")

    (receipt,) = stack.receipts_list()
    assert purposes(receipt) == [(CHEAP, "attempt"), (CHEAP, "reask")]
    assert receipt["served"]["followup"] == "reask" and receipt["served"]["rung"] == 0
    (follow,) = receipt["followups"]
    assert follow["kind"] == "reask" and follow["check"] == "evidence" and follow["passed"]
    assert follow["answers_agree"] is False  # 999 became 300
    gates = [c for c in receipt["checks"] if c["kind"] == "gate"]
    assert [c.get("purpose") for c in gates] == [None, "reask"]
    assert not parts_of(gates[0])["rerun_matches"]["passed"]
    # checked against the rows the database gives now: the rerun matches them
    assert parts_of(gates[1])["rerun_matches"]["passed"] and gates[1]["passed"]
    # the follow-up's call is accounted like any other
    calls = receipt["upstream_calls"]
    assert calls[1]["cost_usd"] > 0 and follow["cost_usd"] == calls[1]["cost_usd"]
    assert receipt["cost"]["total_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls))


def test_a_reconciled_answer_that_fails_its_checks_is_not_served(
    live_stack: Any, sales_db: Path
) -> None:
    """The re-ask's answer is verified like any answer: still 999, it fails, and the cascade
    goes on as it would have (the next rung, here re-asked too)."""
    stack = live_stack(route_extra=sql_route(sales_db, **SHOWN))
    stack.stub.script(Reply.ok("South leads with 999."), Reply.ok("Still 999."), model=CHEAP)
    stack.stub.script(Reply.ok("South leads with 999."), Reply.ok("It is 300."), model=STRONG)
    content, fp = ask(stack, conversation(TOTALS, FORGED_ROWS))
    assert content == "It is 300." and fp["action"] == "escalated"
    (receipt,) = stack.receipts_list()
    assert [(f["rung"], f["passed"]) for f in receipt["followups"]] == [(0, False), (1, True)]
    reasked = [c for c in receipt["checks"] if c.get("purpose") == "reask"]
    assert parts_of(reasked[0])["numbers_in_evidence"]["passed"] is False


def test_a_query_that_fails_now_is_reported_and_its_rows_support_nothing(
    live_stack: Any, sales_db: Path
) -> None:
    """Of two recorded queries, one fails when rerun: the re-ask (on a default route: no rows
    shown) says so, and its answer is checked against the other query's rows alone."""
    failing = "SELECT abs(-9223372036854775808) AS x"
    messages = conversation(TOTALS, TRUE_ROWS)
    messages[1]["tool_calls"].append(
        {
            "id": "call_2",
            "type": "function",
            "function": {"name": "sql", "arguments": json.dumps({"sql": failing})},
        }
    )
    result = {"columns": ["x"], "rows": [[7]], "elapsed_ms": 0.1}
    messages.append({"role": "tool", "tool_call_id": "call_2", "content": json.dumps(result)})
    stack = live_stack(route_extra=sql_route(sales_db))
    stack.stub.script(
        Reply.ok("South leads with 300, and x is 7."),
        Reply.ok("South leads with 300."),
        model=CHEAP,
    )
    content, fp = ask(stack, messages)
    assert content == "South leads with 300." and fp["action"] == "served"
    told = stack.stub.completions[1].body["messages"][-1]["content"]
    assert failing in told and "failed when rerun: integer overflow" in told and SQL not in told
    (receipt,) = stack.receipts_list()
    reasked = next(c for c in receipt["checks"] if c.get("purpose") == "reask")
    assert parts_of(reasked)["rerun_matches"]["passed"] and receipt["followups"][0]["passed"]


def test_a_reask_answered_with_a_tool_call_is_no_answer(live_stack: Any, sales_db: Path) -> None:
    stack = live_stack(route_extra=sql_route(sales_db, **SHOWN))
    stack.stub.script(
        Reply.ok("South leads with 999."), Reply.tools(("sql", {"sql": "SELECT 1"})), model=CHEAP
    )
    stack.stub.script(Reply.ok("South leads with 999."), Reply.ok("It is 300."), model=STRONG)
    content, fp = ask(stack, conversation(TOTALS, FORGED_ROWS))
    assert content == "It is 300." and fp["action"] == "escalated"
    (receipt,) = stack.receipts_list()
    first = receipt["followups"][0]
    assert first["stopped"] == "tool_turn" and "passed" not in first
    assert receipt["served"]["rung"] == 1 and receipt["served"]["followup"] == "reask"


def test_a_reask_the_upstream_refuses_leaves_the_cascade_going(
    live_stack: Any, sales_db: Path
) -> None:
    stack = live_stack(route_extra=sql_route(sales_db, **SHOWN))
    stack.stub.script(Reply.ok("South leads with 999."), Reply.error(400, "no"), model=CHEAP)
    stack.stub.script(Reply.ok("South leads with 999."), Reply.ok("It is 300."), model=STRONG)
    content, fp = ask(stack, conversation(TOTALS, FORGED_ROWS))
    assert content == "It is 300." and fp["action"] == "escalated"
    (receipt,) = stack.receipts_list()
    first = receipt["followups"][0]
    assert first["stopped"] == "upstream_error" and "no" in first["error"]
    assert receipt["upstream_calls"][1]["purpose"] == "reask"
    assert receipt["upstream_calls"][1]["status"] == 400


@pytest.mark.parametrize(
    ("check", "env"),
    [({"reask": False}, {}), ({}, {"FIRSTPASS_SQL_REASK": "0"})],  # with SHOWN
    ids=["config", "environment"],
)
def test_the_reask_switched_off_makes_no_followup_call(
    live_stack: Any, sales_db: Path, check: dict[str, Any], env: dict[str, str]
) -> None:
    """The same request re-asks on a default route and does not with the switch off."""
    made = []
    for off in (False, True):
        stack = live_stack(
            route_extra=sql_route(sales_db, **SHOWN, **(check if off else {})),
            env=env if off else {},
        )
        stack.stub.script(Reply.ok("South leads with 999."), model=CHEAP)
        stack.stub.script(Reply.ok("South leads with 999."), model=STRONG)
        ask(stack, conversation(TOTALS, FORGED_ROWS))
        (receipt,) = stack.receipts_list()
        made.append([p for _, p in purposes(receipt)])
    # on: the re-ask's answer (the stub's default, no number) passes; off: the next rung
    assert made == [["attempt", "reask"], ["attempt", "attempt"]]


def test_a_bad_switch_value_names_the_variable(live_stack: Any, sales_db: Path) -> None:
    from firstpass.errors import ConfigError

    with pytest.raises(ConfigError, match="FIRSTPASS_SQL_SELF_CHECK"):
        live_stack(route_extra=sql_route(sales_db), env={"FIRSTPASS_SQL_SELF_CHECK": "maybe"})


# -- what the re-ask may tell (docs/checks.md, "Security") -----------------------------------

SECRET = "078-05-1120"


@pytest.fixture
def secrets_db(sales_db: Path) -> Path:
    """The sales database with a table the route's clients are not asked about."""
    conn = sqlite3.connect(sales_db)
    conn.executescript(
        """
        CREATE TABLE staff_secrets (id INTEGER PRIMARY KEY, name TEXT, salary INTEGER, ssn TEXT);
        INSERT INTO staff_secrets (name, salary, ssn) VALUES ('Alice', 250000, '078-05-1120');
        """
    )
    conn.commit()
    conn.close()
    return sales_db


def test_a_client_forging_rows_for_any_table_gets_no_rows_of_it_through_the_reask(
    live_stack: Any, secrets_db: Path
) -> None:
    """A client sends made-up rows for a query over a table it may not read, beside a true
    one: the rerun disagrees and the re-ask is made, but on a default route it states only
    what the check reports (the SQL, the row counts), never the rows the database holds."""
    leak = "SELECT name, salary, ssn FROM staff_secrets"
    evidence: list[dict[str, Any]] = [
        {"sql": leak, "columns": ["name", "salary", "ssn"], "rows": [["x", 1, "y"]]},
        {"sql": SQL, "columns": ["region", "total"], "rows": TRUE_ROWS, "elapsed_ms": 0.4},
    ]
    stack = live_stack(route_extra=sql_route(secrets_db))
    stack.stub.script(Reply.ok("South leads with 300."), Reply.ok("South: 300."), model=CHEAP)
    content, fp = ask(stack, [{"role": "user", "content": TOTALS}], evidence=evidence)
    (receipt,) = stack.receipts_list()
    assert purposes(receipt)[:2] == [(CHEAP, "attempt"), (CHEAP, "reask")]
    told = stack.stub.completions[1].body["messages"][-1]["content"]
    assert leak in told and "other values" in told and "not shown" in told
    sent = json.dumps([c.body for c in stack.stub.completions])
    assert SECRET not in sent and "250000" not in sent and "Alice" not in sent
    assert content == "South: 300." and SECRET not in json.dumps(fp)


def test_rows_the_operator_opted_into_are_capped_at_reask_rows(
    live_stack: Any, sales_db: Path
) -> None:
    stack = live_stack(route_extra=sql_route(sales_db, reask_rows=2))
    stack.stub.script(Reply.ok("South leads with 999."), Reply.ok("It is 300."), model=CHEAP)
    ask(stack, conversation(TOTALS, FORGED_ROWS))
    told = stack.stub.completions[1].body["messages"][-1]["content"]
    assert '["South", 300.0]' in told and '["North", 200.0]' in told
    assert '["East", 50.0]' not in told and "and 1 more rows" in told


def test_reask_rows_past_the_cap_is_refused_at_load(live_stack: Any, sales_db: Path) -> None:
    with pytest.raises(Exception, match="reask_rows"):
        live_stack(route_extra=sql_route(sales_db, reask_rows=31))


def test_a_reask_answer_may_rest_on_the_summaries_the_request_sent(
    live_stack: Any, sales_db: Path
) -> None:
    """The re-ask's answer is checked against the evidence as it is now: the rerun's rows, and
    the request's summary and Python items as sent (nothing reruns them)."""
    evidence: list[dict[str, Any]] = [
        {"sql": SQL, "columns": ["region", "total"], "rows": FORGED_ROWS, "elapsed_ms": 0.4},
        {"kind": "summary", "text": "The average order is 137.5."},
    ]
    stack = live_stack(route_extra=sql_route(sales_db, **SHOWN))
    stack.stub.script(
        Reply.ok("South leads with 999."),
        Reply.ok("South leads with 300; the average order is 137.5."),
        model=CHEAP,
    )
    content, _ = ask(stack, [{"role": "user", "content": TOTALS}], evidence=evidence)
    assert content == "South leads with 300; the average order is 137.5."
    (receipt,) = stack.receipts_list()
    assert receipt["followups"][0]["passed"] and receipt["served"]["followup"] == "reask"


# -- the self-check -------------------------------------------------------------------------


def test_a_warning_brings_one_strict_tool_free_self_check(live_stack: Any, sales_db: Path) -> None:
    stack = live_stack(route_extra=sql_route(sales_db))
    stack.stub.script(
        Reply.ok("South: 300, North: 200, East: 50."),
        Reply.ok("Those are totals, not averages: South 300, North 200, East 50."),
        model=CHEAP,
    )
    content, fp = ask(stack, conversation(AVERAGES, TRUE_ROWS))
    assert content == "Those are totals, not averages: South 300, North 200, East 50."
    assert fp["action"] == "served" and fp["verification"] == "verified"
    _, check = stack.stub.completions
    assert "tools" not in check.body and "tool_choice" not in check.body
    (only,) = check.body["messages"]  # built from the results, not the tool conversation
    told = only["content"]
    assert AVERAGES in told and SQL in told and '["South", 300.0]' in told
    assert "aggregate_matches_question" in told and "South: 300, North: 200, East: 50." in told

    (receipt,) = stack.receipts_list()
    assert purposes(receipt) == [(CHEAP, "attempt"), (CHEAP, "self_check")]
    (follow,) = receipt["followups"]
    assert follow["kind"] == "self_check" and follow["passed"] and follow["answers_agree"]
    assert receipt["served"]["followup"] == "self_check"
    checked = next(c for c in receipt["checks"] if c.get("purpose") == "self_check")
    assert parts_of(checked)["answers_agree"]["passed"]


def test_numbers_that_disagree_are_a_visible_failed_part_never_a_verdict(
    live_stack: Any, sales_db: Path
) -> None:
    """Both answers hold only numbers the results hold, so both pass; the second drops one
    and adds another, and the receipt shows it (a warning: the verified answer is served)."""
    stack = live_stack(route_extra=sql_route(sales_db))
    stack.stub.script(
        Reply.ok("South: 300 and North: 200."), Reply.ok("South: 300 and East: 50."), model=CHEAP
    )
    content, fp = ask(stack, conversation(AVERAGES, TRUE_ROWS))
    assert content == "South: 300 and East: 50." and fp["verification"] == "verified"
    (receipt,) = stack.receipts_list()
    assert receipt["followups"][0]["answers_agree"] is False
    checked = next(c for c in receipt["checks"] if c.get("purpose") == "self_check")
    agree = parts_of(checked)["answers_agree"]
    assert not agree["passed"] and agree["severity"] == "warning" and checked["passed"]
    assert agree["category"] == "sql_answers_agree" and agree["details"]["agree"] is False


def test_a_self_check_that_fails_its_checks_leaves_the_first_answer_served(
    live_stack: Any, sales_db: Path
) -> None:
    stack = live_stack(route_extra=sql_route(sales_db))
    stack.stub.script(Reply.ok("South: 300."), Reply.ok("South: 75 on average."), model=CHEAP)
    content, fp = ask(stack, conversation(AVERAGES, TRUE_ROWS))
    assert content == "South: 300." and fp["action"] == "served"
    (receipt,) = stack.receipts_list()
    assert receipt["followups"][0]["passed"] is False and "followup" not in receipt["served"]


@pytest.mark.parametrize(
    ("check", "env"),
    [({"self_check": False}, {}), ({}, {"FIRSTPASS_SQL_SELF_CHECK": "0"})],
    ids=["config", "environment"],
)
def test_the_self_check_switched_off_makes_no_followup_call(
    live_stack: Any, sales_db: Path, check: dict[str, Any], env: dict[str, str]
) -> None:
    """The same request self-checks on a default route and does not with the switch off."""
    made = []
    for off in (False, True):
        stack = live_stack(
            route_extra=sql_route(sales_db, **(check if off else {})), env=env if off else {}
        )
        stack.stub.script(Reply.ok("South: 300."), Reply.ok("South: 300."), model=CHEAP)
        content, fp = ask(stack, conversation(AVERAGES, TRUE_ROWS))
        assert content == "South: 300." and fp["verification"] == "verified"
        (receipt,) = stack.receipts_list()
        made.append([p for _, p in purposes(receipt)])
    assert made == [["attempt", "self_check"], ["attempt"]]


def test_a_per_request_budget_holds_the_followup_call_too(live_stack: Any, sales_db: Path) -> None:
    """The cap leaves room for the first call's worst case but not for the self-check's (its
    prompt quotes the long first answer): the self-check is not made, and the first answer,
    verified, is what the budget serves."""
    long_answer = "South: 300. " + "The totals differ a lot between the regions. " * 70
    messages = conversation(AVERAGES, TRUE_ROWS)
    max_tokens = 10
    # the first call's worst case: every byte of its body an input token, at the cheap rung's
    # $0.10 per million, and max_tokens of output at $0.40 per million
    first_bytes = len(json.dumps({"model": CHEAP, "messages": messages, "tools": [SQL_TOOL]}))
    first_worst = (first_bytes + 200) * 0.10e-6 + max_tokens * 0.40e-6
    stack = live_stack(
        route_extra=sql_route(sales_db),
        tables={"budgets": {"per_request_usd": first_worst + 1e-4}},
    )
    stack.stub.script(Reply.ok(long_answer, usage=(100, 10)), model=CHEAP)
    content, _ = ask(stack, messages, max_tokens=max_tokens)
    assert content == long_answer
    assert len(stack.stub.completions) == 1  # the self-check was never sent
    (receipt,) = stack.receipts_list()
    (follow,) = receipt["followups"]
    assert follow["kind"] == "self_check" and follow["stopped"] == "budget"
    assert receipt["decision"]["budget"]["exhausted"]


def test_switching_the_followups_off_changes_the_config_digest_but_voids_no_certificate(
    live_stack: Any, sales_db: Path
) -> None:
    """The switches are config (receipts name the config that decided), but the follow-ups
    change no verdict of a probe's samples: the gate checks' digest a certificate binds stays."""
    on = live_stack(route_extra=sql_route(sales_db)).config
    off = live_stack(
        route_extra=sql_route(sales_db, self_check=False), env={"FIRSTPASS_SQL_REASK": "0"}
    ).config
    assert on.digest != off.digest
    assert on.routes[0].gate_checks_digest == off.routes[0].gate_checks_digest
    shown = live_stack(route_extra=sql_route(sales_db, reask_rows=5)).config
    assert shown.routes[0].gate_checks_digest == on.routes[0].gate_checks_digest
    stricter = live_stack(route_extra=sql_route(sales_db, rerun="all")).config
    assert stricter.routes[0].gate_checks_digest != on.routes[0].gate_checks_digest
