"""sql_evidence end to end: evidence taken from OpenAI tool-call messages sent through the real
openai SDK, the route's gate checking the answer against it, and the revision loop re-asking
with the failed checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from firstpass.checks._sql import RULES
from tests.server_harness import CHEAP, MODEL, STRONG
from tests.sql_conversation import build_sales_db, sql_tool_conversation
from tests.stub_upstream import Reply

#: e2e: every test drives a live server with the real openai SDK
pytestmark = pytest.mark.e2e


@pytest.fixture
def sales_db(tmp_path: Path) -> Path:
    return build_sales_db(tmp_path / "sales.sqlite")


SQL = "SELECT region, sum(amount) AS total FROM orders GROUP BY region ORDER BY total DESC"
RESULT = {
    "columns": ["region", "total"],
    "rows": [["South", 300.0], ["North", 200.0], ["East", 50.0]],
    "elapsed_ms": 0.4,
    "truncated": False,
}


def conversation() -> list[dict[str, Any]]:
    """What an agent harness sends: the question, its SQL tool call and the tool's result."""
    return sql_tool_conversation("What is the total order amount per region?", SQL, RESULT)


def route(db: Path, **extra: Any) -> dict[str, Any]:
    return {
        "gate_checks": [{"kind": "sql_evidence", "name": "evidence", "database": str(db)}],
        **extra,
    }


def ask(stack: Any) -> Any:
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    return client.chat.completions.create(model=MODEL, messages=conversation())  # type: ignore[arg-type]


GOOD = "South leads with 300, then North with 200 and East with 50."
WRONG = "South leads with 300, then North with 250 and East with 50."


def test_an_answer_the_tool_results_support_is_served_verified(
    live_stack: Any, sales_db: Path
) -> None:
    stack = live_stack(route_extra=route(sales_db))
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    completion = ask(stack)
    fp = completion.model_extra["firstpass"]
    assert completion.choices[0].message.content == GOOD
    assert fp["action"] == "served" and fp["verification"] == "verified"
    (receipt,) = stack.receipts_list()
    (gate,) = [c for c in receipt["checks"] if c["kind"] == "gate"]
    parts = {p["name"]: p for p in gate["results"][0]["parts"]}
    assert list(parts) == [n for n, _ in RULES] and parts["rerun_matches"]["passed"]
    assert parts["numbers_in_evidence"]["passed"]


def test_a_number_the_evidence_does_not_hold_escalates(live_stack: Any, sales_db: Path) -> None:
    stack = live_stack(route_extra=route(sales_db))
    stack.stub.script(Reply.ok(WRONG), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    completion = ask(stack)
    assert completion.choices[0].message.content == GOOD
    assert completion.model_extra["firstpass"]["action"] == "escalated"
    (receipt,) = stack.receipts_list()
    first = next(c for c in receipt["checks"] if c["kind"] == "gate")
    assert first["category"] == "sql_numbers_in_evidence"


def test_the_revision_loop_reasks_with_the_failed_sql_checks(
    live_stack: Any, sales_db: Path
) -> None:
    """A failed gate check re-asks the same rung, naming the check and its category."""
    stack = live_stack(route_extra=route(sales_db, revision={"max_revisions": 1}))
    stack.stub.script(Reply.ok(WRONG), Reply.ok(GOOD), model=CHEAP)
    completion = ask(stack)
    assert completion.choices[0].message.content == GOOD
    assert [c.model for c in stack.stub.completions] == [CHEAP, CHEAP]
    feedback = stack.stub.completions[1].body["messages"][-1]["content"]
    assert (
        "evidence (sql_evidence) failed: numbers_in_evidence: the answer states a number"
        in feedback
    )
    assert "250" not in feedback.split("failed:")[1]  # what failed, never the values


def test_a_recorded_result_the_database_does_not_reproduce_fails_the_rerun(
    live_stack: Any, sales_db: Path
) -> None:
    """The tool message claims rows the query does not return: the cheap rerun catches it
    (the corrective re-ask is off here: tests/test_sql_followups.py has it)."""
    stack = live_stack(
        route_extra=route(sales_db, on_exhausted="error"), env={"FIRSTPASS_SQL_REASK": "0"}
    )
    forged = {**RESULT, "rows": [["South", 999.0], ["North", 200.0], ["East", 50.0]]}
    messages = conversation()
    messages[2]["content"] = json.dumps(forged)
    stack.stub.script(Reply.ok("South leads with 999."), model=CHEAP)
    stack.stub.script(Reply.ok("South leads with 999."), model=STRONG)
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    (receipt,) = stack.receipts_list()
    gates = [c for c in receipt["checks"] if c["kind"] == "gate"]
    assert {c["category"] for c in gates} == {"sql_rerun_matches"}


def test_explicit_evidence_in_the_request_is_used_and_a_malformed_item_is_a_400(
    live_stack: Any, sales_db: Path
) -> None:
    stack = live_stack(route_extra=route(sales_db))
    stack.stub.script(Reply.ok("There are 4 orders."), model=CHEAP)
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    evidence = [
        {"sql": "SELECT count(*) FROM orders", "columns": ["n"], "rows": [[4]], "elapsed_ms": 0.2}
    ]
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "How many orders are there?"}],
        extra_body={"firstpass": {"evidence": evidence}},
    )
    assert completion.model_extra is not None
    assert completion.model_extra["firstpass"]["verification"] == "verified"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "How many orders are there?"}],
            extra_body={"firstpass": {"evidence": [{"sql": "SELECT 1", "rows": "many"}]}},
        )
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == "firstpass.evidence[0].rows"


def test_a_request_cannot_name_a_database(live_stack: Any, sales_db: Path) -> None:
    """sql_evidence is the operator's: a request naming a file would read the server's disk."""
    stack = live_stack()
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "q"}],
            extra_body={
                "firstpass": {"checks": [{"kind": "sql_evidence", "database": str(sales_db)}]}
            },
        )
    assert "config only" in str(info.value)


@pytest.mark.parametrize(
    ("evidence", "param"),
    [
        ("SELECT 1", "firstpass.evidence"),
        ([["SELECT 1"]], "firstpass.evidence"),
        (
            [{"sql": "SELECT 1", "rows": [[{"a": [[[[]]]]}]], "elapsed_ms": -1}],
            "firstpass.evidence[0].elapsed_ms",
        ),
    ],
)
def test_malformed_evidence_is_a_400_naming_where(
    live_stack: Any, sales_db: Path, evidence: Any, param: str
) -> None:
    stack = live_stack(route_extra=route(sales_db))
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "q"}],
            extra_body={"firstpass": {"evidence": evidence}},
        )
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == param
    assert stack.stub.completions == []
    (receipt,) = stack.receipts_list()
    assert receipt["error"]["status"] == 400
