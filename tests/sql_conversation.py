"""What an agent harness sends an ``sql_evidence`` route: the question, one SQL tool call and
the tool's result (shared by the SQL end-to-end tests)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def sql_tool_conversation(
    question: str, sql: str, result: Mapping[str, Any], *, tool: str = "sql"
) -> list[dict[str, Any]]:
    """The user's question, the assistant's call of ``tool`` with ``sql``, the tool's JSON."""
    return [
        {"role": "user", "content": question},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": tool, "arguments": json.dumps({"sql": sql})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(dict(result))},
    ]
