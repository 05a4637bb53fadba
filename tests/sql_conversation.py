"""What an agent harness sends an ``sql_evidence`` route: the question, one SQL tool call and
the tool's result, and the small sales database they ask about (shared by the SQL end-to-end
tests)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from pathlib import Path
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


def build_sales_db(path: Path) -> Path:
    """Four orders in three regions: South 300.0, North 200.0, East 50.0 in total."""
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE orders (id INTEGER PRIMARY KEY, region TEXT, amount REAL);
        INSERT INTO orders (region, amount) VALUES
            ('North', 120.5), ('North', 79.5), ('South', 300.0), ('East', 50.0);
        """
    )
    conn.commit()
    conn.close()
    return path
