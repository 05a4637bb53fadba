"""One pipeline whatever the API: the bundled demo tasks sent through Chat Completions, OpenAI
Responses and Anthropic Messages, each with its real SDK against its own fresh server (the
replay upstream draws the same samples in each), give the same verdicts, costs and receipts
apart from the dialect (and ids, times and hashes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from firstpass.demo.runner import DEMO_MAX_TOKENS, DEMO_MODEL, demo_config, load_demo_tasks

pytestmark = pytest.mark.e2e

#: receipt fields that differ between any two runs (or name the dialect), dropped before
#: comparing: ids and chain hashes, times, and the dialect itself
_VOLATILE = {
    "id", "time", "hash", "prev_hash", "timings_ms", "dialect", "latency_ms", "ms",
    "config_digest",
}  # fmt: skip


def _firstpass(task: dict[str, Any]) -> dict[str, Any]:
    fp: dict[str, Any] = {
        "tests": {"visible": task["visible_tests"], "hidden": task["hidden_tests"]},
        "entry_point": task["entry_point"],
        "task_id": task["task_id"],
    }
    if task.get("setup"):
        fp["setup"] = task["setup"]
    return fp


def _chat(base: str, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model=DEMO_MODEL,
        messages=[{"role": "user", "content": task["prompt"]}],
        max_tokens=DEMO_MAX_TOKENS,
        extra_body={"firstpass": _firstpass(task)},
    )
    extra = answer.model_extra or {}
    return answer.choices[0].message.content or "", extra["firstpass"]


def _responses(base: str, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    answer = client.responses.create(
        model=DEMO_MODEL,
        input=task["prompt"],
        max_output_tokens=DEMO_MAX_TOKENS,
        extra_body={"firstpass": _firstpass(task)},
    )
    extra = answer.model_extra or {}
    return answer.output_text, extra["firstpass"]


def _messages(base: str, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    answer = client.messages.create(
        model=DEMO_MODEL,
        max_tokens=DEMO_MAX_TOKENS,
        messages=[{"role": "user", "content": task["prompt"]}],
        extra_body={"firstpass": _firstpass(task)},
    )
    text = "".join(block.text for block in answer.content if block.type == "text")
    extra = answer.model_extra or {}
    return text, extra["firstpass"]


ASK = {"chat": _chat, "responses": _responses, "messages": _messages}


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _run(live_stack: Any, tmp_path: Path, dialect: str) -> tuple[list[Any], list[Any]]:
    stack = live_stack()
    receipts = tmp_path / f"{dialect}.jsonl"
    stack.receipts = receipts
    stack.config = demo_config(receipts)
    stack.restart()
    base = stack.base_url.removesuffix("/v1")
    seen = []
    for task in load_demo_tasks():
        text, fp = ASK[dialect](base, dict(task))
        seen.append(
            (
                task["task_id"],
                text,
                fp["action"],
                fp["served_model"],
                fp["verification"],
                fp["gate"],
                fp["cost_usd"],
            )
        )
    written = [r for r in stack.receipts_list() if "kind" not in r]
    assert {r["request"]["dialect"] for r in written} == {dialect}
    return seen, [_strip(r) for r in written]


def test_the_demo_tasks_give_the_same_verdicts_costs_and_receipts_through_all_three_apis(
    live_stack: Any, tmp_path: Path
) -> None:
    chat, chat_receipts = _run(live_stack, tmp_path, "chat")
    assert {row[2] for row in chat} >= {"served", "escalated"}  # the demo's mix, not a blank
    for dialect in ("responses", "messages"):
        seen, receipts = _run(live_stack, tmp_path, dialect)
        assert seen == chat, dialect
        assert receipts == chat_receipts, dialect
