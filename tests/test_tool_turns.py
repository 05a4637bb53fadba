"""Tool-call turns pass through a verified route as the upstream sent them; final answers are
verified. Through the real openai SDK against the running server (a stub upstream scripts the
model's turns)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam

from tests.add_task import GOOD, TESTS, WRONG
from tests.certificates import elastic_block
from tests.server_harness import CHEAP, MODEL, STRONG
from tests.stub_upstream import Reply

TOOLS: list[ChatCompletionFunctionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "run the unit tests on a draft",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
]
FIRST_TURN: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "write add(a, b); you may run the tests first"}
]


def _client(stack: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)


def _ask(stack: Any, messages: list[ChatCompletionMessageParam], **firstpass: Any) -> Any:
    return _client(stack).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,
        tools=TOOLS,
        extra_body={"firstpass": {**TESTS, **firstpass}},
    )


def _tool_reply(**kwargs: Any) -> Reply:
    return Reply.tools(("run_tests", {"code": "def add(a, b): return a + b"}), **kwargs)


@pytest.mark.e2e
def test_a_tool_turn_reaches_the_client_intact_unchecked_and_receipted_as_a_tool_turn(
    live_stack: Any,
) -> None:
    """The cheap rung calls a tool: the client gets that turn as the upstream sent it (id,
    name, arguments, finish_reason), after one upstream call and no check; the receipt says
    ``tool_turn``."""
    stack = live_stack()
    stack.stub.script(_tool_reply(), model=CHEAP)
    raw = _ask(stack, FIRST_TURN)
    completion = raw.parse()
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id == "call_0" and call.type == "function"
    assert call.function.name == "run_tests"
    assert json.loads(call.function.arguments) == {"code": "def add(a, b): return a + b"}
    assert completion.id.startswith("chatcmpl-stub-")  # the upstream's own response
    assert raw.headers["X-Firstpass-Action"] == "tool_turn"
    assert raw.headers["X-Firstpass-Regime"] == "tool_turn"
    assert float(raw.headers["X-Firstpass-Cost-USD"]) > 0
    assert [c.model for c in stack.stub.completions] == [CHEAP]
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["action"] == "tool_turn"
    assert receipt["checks"] == []
    assert receipt["served"]["verification"] == "unchecked"
    assert receipt["request"]["dialect"] == "chat"
    fp = completion.model_extra["firstpass"]
    assert fp["action"] == "tool_turn" and fp["receipt_id"] == receipt["id"]


@pytest.mark.e2e
def test_a_streamed_tool_turn_accumulates_to_the_same_tool_calls_in_the_sdk(
    live_stack: Any,
) -> None:
    """Streamed, the SDK's accumulator rebuilds the tool calls whole from the chunks."""
    stack = live_stack()
    stack.stub.script(
        Reply.tools(("run_tests", {"code": "x"}), ("lookup", {"q": "add"}), text="Let me check."),
        model=CHEAP,
    )
    with _client(stack).chat.completions.stream(
        model=MODEL, messages=FIRST_TURN, tools=TOOLS, extra_body={"firstpass": TESTS}
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    calls = choice.message.tool_calls or []
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("call_0", "run_tests", {"code": "x"}),
        ("call_1", "lookup", {"q": "add"}),
    ]
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["action"] == "tool_turn"


@pytest.mark.e2e
def test_the_final_turn_after_tool_results_is_verified_and_escalates_on_failure(
    live_stack: Any,
) -> None:
    """The turn that comes back with the tool's result is a final answer: checked, and a
    failing one climbs the ladder as always; each turn has its own receipt."""
    stack = live_stack()
    stack.stub.script(_tool_reply(), model=CHEAP)
    first = _ask(stack, FIRST_TURN).parse()
    call = first.choices[0].message.tool_calls[0]
    stack.stub.script(Reply.ok(WRONG), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    second_turn: list[ChatCompletionMessageParam] = [
        *FIRST_TURN,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "1 passed"},
    ]
    raw = _ask(stack, second_turn)
    answer = raw.parse().choices[0]
    assert answer.message.content == GOOD and answer.message.tool_calls is None
    assert raw.headers["X-Firstpass-Action"] == "escalated"
    sent = stack.stub.completions[1].body["messages"]
    assert sent[1]["tool_calls"][0]["id"] == call.id
    assert sent[2] == {"role": "tool", "tool_call_id": call.id, "content": "1 passed"}
    tool_turn, final = stack.receipts_list()
    assert tool_turn["decision"]["action"] == "tool_turn"
    assert final["decision"]["action"] == "escalated"
    assert final["served"]["verification"] == "verified"


@pytest.mark.e2e
def test_tool_turns_verify_checks_a_tool_call_like_a_final_answer(live_stack: Any) -> None:
    """``tool_turns = "verify"``: the tool call is judged as the answer; its (empty) content
    fails the tests and the strong rung is asked."""
    stack = live_stack(route_extra={"tool_turns": "verify"})
    stack.stub.script(_tool_reply(), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    raw = _ask(stack, FIRST_TURN)
    assert raw.parse().choices[0].message.content == GOOD
    assert raw.headers["X-Firstpass-Action"] == "escalated"
    (receipt,) = stack.receipts_list()
    assert [c["kind"] for c in receipt["checks"]][:1] == ["visible"]


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["shadow", "enforce"])
def test_the_elastic_probe_does_nothing_on_a_tool_turn(live_stack: Any, mode: str) -> None:
    """Elastic draws its k samples; when sample 0 ends in tool calls that sample goes out as
    the tool turn it is (the cascade's first attempt would have been exactly it): no check
    runs, no regime, no label, no probe record."""
    stack = live_stack(elastic=elastic_block(mode))
    five = Reply(texts=("",) * 5, tool_calls=_tool_reply().tool_calls, finish_reason="tool_calls")
    stack.stub.script(five, model=CHEAP)
    raw = _ask(stack, FIRST_TURN, mode=mode)
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "run_tests"
    assert raw.headers["X-Firstpass-Action"] == "tool_turn"
    assert [(c.model, c.n) for c in stack.stub.completions] == [(CHEAP, 5)]
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["action"] == "tool_turn"
    assert receipt["checks"] == []
    assert receipt.get("probe") is None
    assert receipt["decision"]["counterfactual"] is None
    assert receipt["decision"]["gate_label"] is None
    (call,) = receipt["upstream_calls"]
    assert call["purpose"] == "probe" and call["n"] == 5


@pytest.mark.e2e
def test_a_probe_sample_that_calls_a_tool_never_counts_as_a_pass(live_stack: Any) -> None:
    """Sample 0 is a final answer, samples 1-4 end in tool calls with a passing text beside
    them: the pass count is 1 of 5, not 5 of 5 (which would skip the gate), and the answer
    served is sample 0, never a tool-call sample."""
    stack = live_stack(elastic=elastic_block("enforce"))
    mixed = Reply(
        texts=(GOOD,) * 5,
        tool_calls=_tool_reply().tool_calls,
        tool_choices=frozenset({1, 2, 3, 4}),
        finish_reason="stop",
    )
    stack.stub.script(mixed, model=CHEAP)
    raw = _ask(stack, FIRST_TURN)
    choice = raw.parse().choices[0]
    assert choice.message.content == GOOD and choice.message.tool_calls is None
    (receipt,) = stack.receipts_list()
    assert receipt["probe"]["pass_count"] == 1
    assert receipt["served"]["sample"] == 0
