"""An agent loop through a ``sql_evidence`` route: the real openai SDK calls the model with a SQL
tool, runs each call's SQL against a real SQLite database, sends the result back, and asks again
until the model answers. The stub upstream plays the model, choosing its turn from the
conversation; Firstpass passes the tool turns through and verifies the final answer against the
SQL the loop really ran."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
)

from firstpass.checks._sql import RULES
from tests.certificates import elastic_block
from tests.server_harness import CHEAP, MODEL, STRONG
from tests.stub_upstream import Reply

#: e2e: every test drives a live server with the real openai SDK
pytestmark = pytest.mark.e2e

SQL_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "sql",
        "description": "run one read-only SQLite query on the music database",
        "parameters": {
            "type": "object",
            "properties": {"sql": {"type": "string"}},
            "required": ["sql"],
        },
    },
}
QUESTION = "How many singers from France are there, and how many concerts did they give in all?"
#: what the model asks for, turn by turn: a count, then a join (the loop's answers: 3 and 6)
SQL_FRENCH = "SELECT count(*) AS singers FROM singers WHERE country = 'France'"
SQL_CONCERTS = (
    "SELECT count(*) AS concerts FROM concerts c JOIN singers s ON s.id = c.singer_id "
    "WHERE s.country = 'France'"
)
GOOD = "There are 3 singers from France, and they gave 6 concerts in all."
#: 7 concerts: no result holds 7 (the join returned 6)
WRONG = "There are 3 singers from France, and they gave 7 concerts in all."


@pytest.fixture
def music_db(tmp_path: Path) -> Path:
    """A small singers/concerts database: 3 French singers with 6 concerts between them."""
    path = tmp_path / "music.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE singers (id INTEGER PRIMARY KEY, name TEXT, country TEXT, age INTEGER);
        CREATE TABLE concerts (
            id INTEGER PRIMARY KEY, singer_id INTEGER REFERENCES singers(id),
            venue TEXT, year INTEGER
        );
        INSERT INTO singers (id, name, country, age) VALUES
            (1, 'Edith', 'France', 48), (2, 'Jacques', 'France', 49), (3, 'Celine', 'Canada', 56),
            (4, 'Serge', 'France', 62), (5, 'Adele', 'UK', 36);
        INSERT INTO concerts (singer_id, venue, year) VALUES
            (1, 'Olympia', 2019), (1, 'Bataclan', 2020), (1, 'Zenith', 2021), (2, 'Olympia', 2018),
            (3, 'Bell Centre', 2019), (4, 'Zenith', 2017), (4, 'Olympia', 2022),
            (5, 'Wembley', 2016);
        """
    )
    conn.commit()
    conn.close()
    return path


def sql_route(db: Path, *, where: str = "gate_checks", **extra: Any) -> dict[str, Any]:
    """The route's keys: one sql_evidence check on ``db`` (as a gate or a visible check)."""
    return {where: [{"kind": "sql_evidence", "name": "evidence", "database": str(db)}], **extra}


# -- the model the stub plays ---------------------------------------------------------------


def _tool_call(call_id: str, sql: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "sql", "arguments": json.dumps({"sql": sql})},
    }


@dataclass
class ScriptedModel:
    """The stub's responder: the turn a model would take given how many tool results it has
    seen (none: count the French singers; one: join to count their concerts; two: answer).
    ``finals[model]`` is that model's final answer; every tool turn it sends is kept in
    ``sent`` so the test can compare it with what the client received."""

    finals: Mapping[str, str]
    sent: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, body: dict[str, Any]) -> Reply:
        seen = sum(1 for m in body["messages"] if m.get("role") == "tool")
        n = body.get("n", 1)
        if seen < 2:
            call = _tool_call(f"call_sql_{seen + 1}", (SQL_FRENCH, SQL_CONCERTS)[seen])
            self.sent.append(call)
            return Reply(texts=("",) * n, tool_calls=(call,), finish_reason="tool_calls")
        return Reply.ok(*(self.finals[body["model"]],) * n)


# -- the agent loop -------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One answer the loop got: its finish reason, text and tool calls (OpenAI's shape)."""

    finish_reason: str
    content: str | None
    tool_calls: list[ChatCompletionMessageFunctionToolCallParam]


def run_sql(db: Path, sql: str) -> str:
    """Execute ``sql`` read-only and give the tool's result as the SQL tool's JSON."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        started = time.perf_counter()
        cursor = conn.execute(sql)
        rows = [list(r) for r in cursor.fetchall()]
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        columns = [d[0] for d in cursor.description]
    finally:
        conn.close()
    return json.dumps(
        {"columns": columns, "rows": rows, "elapsed_ms": elapsed_ms, "truncated": False}
    )


def _ask(
    client: openai.OpenAI, messages: list[ChatCompletionMessageParam], *, stream: bool
) -> Turn:
    completion: ChatCompletion
    if stream:
        with client.chat.completions.stream(
            model=MODEL, messages=messages, tools=[SQL_TOOL]
        ) as events:
            for _ in events:
                pass
            completion = events.get_final_completion()
    else:
        completion = client.chat.completions.create(
            model=MODEL, messages=messages, tools=[SQL_TOOL]
        )
    choice = completion.choices[0]
    calls: list[ChatCompletionMessageFunctionToolCallParam] = []
    for c in choice.message.tool_calls or []:
        assert isinstance(c, ChatCompletionMessageFunctionToolCall), c
        calls.append(
            {
                "id": c.id,
                "type": c.type,
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
        )
    return Turn(choice.finish_reason, choice.message.content, calls)


def agent_loop(
    stack: Any, db: Path, *, stream: bool = False, max_turns: int = 6
) -> tuple[list[Turn], list[ChatCompletionMessageParam]]:
    """Ask, run every SQL call the answer makes, send the results back, until an answer does
    not end in tool calls; the turns received, and the conversation as last sent."""
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
    turns: list[Turn] = []
    for _ in range(max_turns):
        turn = _ask(client, messages, stream=stream)
        turns.append(turn)
        if turn.finish_reason != "tool_calls":
            return turns, messages
        messages.append(
            {"role": "assistant", "content": turn.content, "tool_calls": turn.tool_calls}
        )
        for call in turn.tool_calls:
            sql = json.loads(call["function"]["arguments"])["sql"]
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": run_sql(db, sql)}
            )
    raise AssertionError(f"no final answer in {max_turns} turns")


def _evidence(receipt: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The sql_evidence results on a receipt, with the rung and stage that ran each."""
    return [
        {"rung": entry["rung"], "stage": entry["kind"], **result}
        for entry in receipt["checks"]
        for result in entry.get("results", [])
        if result["kind"] == "sql_evidence"
    ]


def _assert_tool_turns_intact(turns: list[Turn], model: ScriptedModel) -> None:
    """Every tool turn reached the client as the stub sent it: ids, names, arguments."""
    assert [t.finish_reason for t in turns[:-1]] == ["tool_calls", "tool_calls"]
    assert [t.tool_calls for t in turns[:-1]] == [[call] for call in model.sent[:2]]
    assert [c["id"] for t in turns[:-1] for c in t.tool_calls] == ["call_sql_1", "call_sql_2"]
    assert all(t.content is None for t in turns[:-1])


def _assert_tool_turn_receipts(receipts: list[dict[str, Any]]) -> None:
    for receipt in receipts:
        assert receipt["decision"]["action"] == "tool_turn"
        assert receipt["checks"] == []
        assert receipt["served"]["verification"] == "unchecked"
        assert receipt["served"]["model"] == CHEAP


# -- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_an_agent_loop_over_sqlite_gets_its_tool_turns_intact_and_its_answer_verified(
    live_stack: Any, music_db: Path, stream: bool
) -> None:
    """Three turns through a sql_evidence route: two SQL tool calls come back as the model sent
    them, unchecked and receipted ``tool_turn``; the final answer is checked against the SQL
    the loop ran (rerun on the database) and served verified by the cheap rung; one receipt
    per request."""
    stack = live_stack(route_extra=sql_route(music_db))
    model = ScriptedModel(finals={CHEAP: GOOD, STRONG: GOOD})
    stack.stub.responder = model
    turns, messages = agent_loop(stack, music_db, stream=stream)

    assert len(turns) == 3
    assert [c.model for c in stack.stub.completions] == [CHEAP, CHEAP, CHEAP]
    _assert_tool_turns_intact(turns, model)
    assert turns[-1].finish_reason == "stop" and turns[-1].content == GOOD
    assert turns[-1].tool_calls == []
    # the loop really ran the SQL: the results it sent back are the database's
    results = [json.loads(str(m["content"])) for m in messages if m["role"] == "tool"]
    assert [(r["columns"], r["rows"]) for r in results] == [
        (["singers"], [[3]]),
        (["concerts"], [[6]]),
    ]
    # the model saw every call and result: the final request carried the whole conversation
    final_sent = stack.stub.completions[-1].body["messages"]
    assert [m["role"] for m in final_sent] == ["user", "assistant", "tool", "assistant", "tool"]
    assert [m["tool_calls"] for m in final_sent if m["role"] == "assistant"] == [
        [call] for call in model.sent
    ]

    receipts = stack.receipts_list()
    assert len(receipts) == len(turns)  # one receipt per HTTP request
    assert [r["request"]["stream"] for r in receipts] == [stream] * 3
    _assert_tool_turn_receipts(receipts[:2])
    final = receipts[-1]
    assert final["decision"]["action"] == "served"
    assert final["served"]["verification"] == "verified"
    assert (final["served"]["rung"], final["served"]["model"]) == (0, CHEAP)
    (evidence,) = _evidence(final)
    assert evidence["passed"] and evidence["verdict"] == "pass" and evidence["rung"] == 0
    parts = {p["name"]: p for p in evidence["parts"]}
    assert all(p["passed"] for p in parts.values()) and list(parts) == [n for n, _ in RULES]
    for ran in ("tables_exist", "rerun_matches", "numbers_in_evidence"):  # ran, not skipped
        assert not parts[ran].get("details", {}).get("skipped"), parts[ran]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_final_answer_stating_a_number_no_query_returned_escalates_after_the_tool_turns(
    live_stack: Any, music_db: Path, stream: bool
) -> None:
    """The cheap rung ends the loop with 7 concerts where the join returned 6: its answer fails
    ``sql_numbers_in_evidence`` and the strong rung, given the same conversation, answers
    right and is served; the tool turns before it went through untouched."""
    stack = live_stack(route_extra=sql_route(music_db))
    model = ScriptedModel(finals={CHEAP: WRONG, STRONG: GOOD})
    stack.stub.responder = model
    turns, _ = agent_loop(stack, music_db, stream=stream)

    assert len(turns) == 3
    assert [c.model for c in stack.stub.completions] == [CHEAP, CHEAP, CHEAP, STRONG]
    _assert_tool_turns_intact(turns, model)
    assert turns[-1].content == GOOD and turns[-1].finish_reason == "stop"
    assert (
        stack.stub.completions[-1].body["messages"] == stack.stub.completions[-2].body["messages"]
    )

    receipts = stack.receipts_list()
    assert len(receipts) == 3
    _assert_tool_turn_receipts(receipts[:2])
    final = receipts[-1]
    assert final["decision"]["action"] == "escalated"
    assert (final["served"]["rung"], final["served"]["model"]) == (1, STRONG)
    assert final["served"]["verification"] == "verified"
    failed, passed = _evidence(final)
    assert (failed["rung"], failed["passed"], failed["category"]) == (
        0,
        False,
        "sql_numbers_in_evidence",
    )
    assert (passed["rung"], passed["passed"]) == (1, True)
    (gate_0,) = [c for c in final["checks"] if c["rung"] == 0]
    assert gate_0["category"] == "sql_numbers_in_evidence"


def test_in_elastic_shadow_the_tool_turns_are_not_probed_and_the_final_answer_is(
    live_stack: Any, music_db: Path
) -> None:
    """Elastic shadow draws its k samples on every turn; the two tool turns go out as sample 0
    is, receipted ``tool_turn`` with no probe record and no checks; the final answer's k
    samples are scored by the sql_evidence visible check and the cascade's answer is served."""
    stack = live_stack(
        route_extra=sql_route(music_db, where="visible_checks"), elastic=elastic_block("shadow")
    )
    model = ScriptedModel(finals={CHEAP: GOOD, STRONG: GOOD})
    stack.stub.responder = model
    turns, _ = agent_loop(stack, music_db)

    assert len(turns) == 3
    assert [(c.model, c.n) for c in stack.stub.completions] == [(CHEAP, 5)] * 3
    _assert_tool_turns_intact(turns, model)
    assert turns[-1].content == GOOD

    receipts = stack.receipts_list()
    assert len(receipts) == 3
    _assert_tool_turn_receipts(receipts[:2])
    for receipt in receipts[:2]:
        assert receipt.get("probe") is None
        assert receipt["decision"]["counterfactual"] is None
        assert receipt["decision"]["gate_label"] is None
    final = receipts[-1]
    assert final["mode"] == "shadow"
    assert final["probe"] is not None and final["probe"]["k"] == 5
    assert [s["n_passed"] for s in final["probe"]["samples"]] == [1] * 5
    assert final["served"]["verification"] == "verified"
    assert all(e["passed"] for e in _evidence(final))
