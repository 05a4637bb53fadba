"""Tool-call turns pass through a verified route as the upstream sent them; final answers are
verified. Through the real openai SDK against the running server (a stub upstream scripts the
model's turns)."""

from __future__ import annotations

import hashlib
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


# -- fixes from the attack review ------------------------------------------------------------

CALL = {
    "id": "call_z",
    "type": "function",
    "function": {"name": "run_tests", "arguments": '{"code": "q"}'},
}


def _mixed(texts: tuple[str, ...], tools: frozenset[int]) -> Reply:
    return Reply(texts=texts, tool_calls=(CALL,), tool_choices=tools, finish_reason="stop")


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["shadow", "enforce"])
def test_a_tool_call_sample_is_never_the_candidate_served_or_labelled(
    live_stack: Any, mode: str
) -> None:
    """No sample passes; the tool-call samples' texts would pass: the candidate elastic keeps
    (and serves unverified at exhaustion, and shadow labels) is still the one answer, sample 0
    (once the best-by-share fallback picked a tool-call sample)."""
    stack = live_stack(elastic=elastic_block(mode))
    stack.stub.script(_mixed((WRONG, GOOD, GOOD, GOOD, GOOD), frozenset({1, 2, 3, 4})), model=CHEAP)
    stack.stub.script(Reply.ok(WRONG), model=STRONG)
    raw = _ask(stack, FIRST_TURN, mode=mode)
    choice = raw.parse().choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    (receipt,) = stack.receipts_list()
    assert receipt["probe"]["pass_count"] == 0
    assert receipt["served"]["rung"] == 1  # the exhausted ladder serves its top attempt
    if mode == "shadow":
        assert receipt["decision"]["label_sample"] == 0
    labels = [c for c in receipt["checks"] if c.get("purpose") == "label"]
    assert all(c["sample"] == 0 for c in labels)


@pytest.mark.e2e
def test_shadow_makes_no_second_call_past_a_tool_turn_on_a_later_rung(live_stack: Any) -> None:
    """Rung 0 escalates in shadow and the cascade's rung 1 answers with a tool call: that
    turn is served, and nothing more is called to label it (once a label call followed)."""
    stack = live_stack(elastic=elastic_block("shadow"))
    stack.stub.script(Reply.ok(*[WRONG] * 5), model=CHEAP)
    stack.stub.script(_tool_reply(), model=STRONG)
    raw = _ask(stack, FIRST_TURN, mode="shadow")
    assert raw.headers["X-Firstpass-Action"] == "tool_turn"
    assert raw.headers["X-Firstpass-Regime"] == "tool_turn"  # not the rung-0 probe's
    assert [(c.model, c.n) for c in stack.stub.completions] == [(CHEAP, 5), (STRONG, 1)]
    (receipt,) = stack.receipts_list()
    assert [c["purpose"] for c in receipt["upstream_calls"]] == ["probe", "attempt"]


@pytest.mark.e2e
@pytest.mark.parametrize("stream", [False, True])
def test_a_legacy_function_call_turn_reaches_the_client_as_the_upstream_sent_it(
    live_stack: Any, stream: bool
) -> None:
    """A legacy ``function_call`` (no ``tool_calls``), plain and streamed: the client gets a
    ``function_call``, not a ``tool_calls`` item with an invented id; the receipt's answer hash
    is of the message's own fields, as docs/receipts.md says."""
    stack = live_stack()
    legacy = {"name": "run_tests", "arguments": '{"code": "q"}'}
    message = {"role": "assistant", "content": None, "function_call": legacy}
    stack.stub.script(Reply(choice_message=message, finish_reason="function_call"), model=CHEAP)
    client = _client(stack)
    if stream:
        with client.chat.completions.stream(
            model=MODEL, messages=FIRST_TURN, extra_body={"firstpass": TESTS}
        ) as events:
            for _ in events:
                pass
            got = events.get_final_completion().choices[0]
    else:
        got = _ask(stack, FIRST_TURN).parse().choices[0]
    assert got.finish_reason == "function_call"
    assert got.message.function_call is not None
    assert got.message.function_call.name == "run_tests"
    assert got.message.function_call.arguments == '{"code": "q"}'
    assert not got.message.tool_calls
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["action"] == "tool_turn"
    shown = json.dumps(
        {"content": "", "function_call": legacy},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    digest = hashlib.sha256(shown.encode("utf-8")).hexdigest()
    assert receipt["served"]["answer_sha256"] == f"sha256:{digest}"


@pytest.mark.e2e
def test_finish_reason_tool_calls_without_any_call_is_checked_as_a_final_answer(
    live_stack: Any,
) -> None:
    """An upstream that says ``tool_calls`` but calls nothing has given an answer, and it is
    verified like one (a wrong one escalates): the finish reason alone is not a tool turn."""
    stack = live_stack()
    stack.stub.script(Reply.ok(WRONG, finish_reason="tool_calls"), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    raw = _ask(stack, FIRST_TURN)
    assert raw.parse().choices[0].message.content == GOOD
    assert raw.headers["X-Firstpass-Action"] == "escalated"


@pytest.mark.e2e
def test_a_revision_that_calls_a_tool_is_never_served_as_a_verified_answer(
    live_stack: Any,
) -> None:
    """Asked for the corrected answer, the model calls a tool: that is no answer to check or
    serve; the loop stops (``stopped: "tool_turn"``) and the ladder goes on."""
    stack = live_stack(route_extra={"revision": {"max_revisions": 2}})
    stack.stub.script(Reply.ok(WRONG), _tool_reply(), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    raw = _ask(stack, FIRST_TURN)
    choice = raw.parse().choices[0]
    assert choice.message.content == GOOD and choice.message.tool_calls is None
    assert raw.headers["X-Firstpass-Action"] == "escalated"
    (receipt,) = stack.receipts_list()
    (loop,) = receipt["revisions"]
    assert loop["stopped"] == "tool_turn" and loop["attempts"][0]["passed"] is False


@pytest.mark.e2e
def test_an_upstream_refusal_reaches_the_client_when_it_is_served(live_stack: Any) -> None:
    """Every rung refuses (content null, ``refusal`` set): what the exhausted ladder serves
    carries the refusal, as OpenAI sends it, not an empty answer."""
    stack = live_stack()
    refusal = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    stack.stub.script(Reply(choice_message=refusal), model=CHEAP)
    stack.stub.script(Reply(choice_message=refusal), model=STRONG)
    got = _ask(stack, FIRST_TURN).parse().choices[0].message
    assert got.refusal == "I can't help with that."
    assert got.content is None
